"""`python -m pretrain_planner ...`: the `pretrain-planner` console script."""

from pretrain_planner.cli import main

raise SystemExit(main())
