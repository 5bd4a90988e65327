import math

from realm.eval.mlm import probability_raise


def test_examples_rank_by_how_much_likelier_the_block_makes_the_span():
    """The report's worked examples: a block that takes the span from 0.2 to 0.6 is the evidence to show; one that
    takes it from 1e-12 to 1e-10 (a 100-fold ratio) changes nothing a reader would see."""
    likely = probability_raise(math.log(0.2), math.log(0.6))
    unseen = probability_raise(math.log(1e-12), math.log(1e-10))
    assert math.isclose(likely, 0.4)
    assert likely > unseen > 0
    assert probability_raise(math.log(0.5), math.log(0.1)) < 0  # a block that misleads ranks last
