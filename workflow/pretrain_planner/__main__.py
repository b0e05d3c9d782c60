"""`python -m pretrain_planner ...`: the `pretrain-planner` console script."""

from .cli import main

raise SystemExit(main())
