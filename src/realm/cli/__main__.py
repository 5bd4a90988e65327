"""`python -m realm.cli ...` (what torchrun runs): the same as the `realm` command."""

import sys

from realm.cli.main import main

sys.exit(main())
