"""Operating upwell: the reconciler (missed, dead-lettered and poisoned events, with the change feed),
the janitor, and the dashboard's data. The rules they apply to cost (prices, estimates, budgets, the
kill switch, tags) are ``upwell.cost``."""
