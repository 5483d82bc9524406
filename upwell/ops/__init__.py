"""Operations that keep the pipeline whole: the reconciler (missed, dead-lettered and poisoned events)."""
