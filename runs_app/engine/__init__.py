"""The trial engine: everything that executes one trial, in rooms.

- `runner`: claims a trial and runs its phases in order (setup, hooks, agent, grading,
  post_run), then stores the outcome; `context` is what the phases share (transcript, lease,
  secrets to redact, the roles' spending);
- `trial_sandbox`: the trial's sandbox as the phases use it (folders, bundles, the task's
  environment, one command of a phase with that phase's limits and mounts);
- `agent_phase`: the agent's process or conversation, returning its result; `grading`: the
  criteria on the finished workspace and the agent's trace;
- `sandbox/`: the sandbox object and its drivers (`bubblewrap/`), process control, limits;
- `gateway/`: the per-trial model proxy, the provider table as it uses it, the roles' calls;
- `agents/`: one module per kind (its row in `experiments_app.specs.agent_kinds`);
- `criteria/`: one module per family (the types of `experiments_app.specs.criteria`);
- `simulation/`: the simulated user; `usage`: tokens, budgets, prices (below gateway and
  agents); `suite_hooks`, `suites`, `regrade`, `hosts`, `leases`, `recording`.

The engine never reaches back into run control (`runs_app.control` decides what a worker does
next), the analysis or the pages. `sandbox`, `gateway`, `agents` and `criteria` import no Django
and never each other (`pyproject.toml`'s contracts).
"""
