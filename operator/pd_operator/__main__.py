"""`python -m pd_operator run ...`: the operator, as the `pd-operator` console script."""

import sys

from pd_operator.controller.main import main

sys.exit(main())
