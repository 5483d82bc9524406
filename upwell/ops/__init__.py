"""Operating upwell: the reconciler (missed, dead-lettered and poisoned events), tags, the janitor, the
dashboard's data, cost roll-ups, estimates."""
