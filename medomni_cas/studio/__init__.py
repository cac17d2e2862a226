"""Studio: the files users write (datasets, templates, cohorts, labels, benchmarks, task sets)."""
