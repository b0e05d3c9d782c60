"""Tables (no torch): every result joined with the plan, days to train, feasibility, costs and the Pareto
front, the exported plans, and where a sweep stands (status)."""
