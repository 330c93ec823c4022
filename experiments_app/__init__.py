"""What to evaluate: tasks, task sets, experiments and variants (imports nothing from runs_app)."""
