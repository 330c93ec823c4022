"""The trial engine: everything that executes one trial.

`runner` claims a trial and runs it (setup, agent, grading, persisting) inside `sandbox` /
`containment` process control, on a `workspace`; `agents/` turns a kind into a command line and
a parser of its output; `criteria/` grades the finished workspace; `suites` rolls dataset trials
up into suite thresholds at a run's end. The engine never reaches back into run control
(`runs_app.control` decides what a worker does next), the analysis or the pages; `agents` and
`criteria` import no Django.
"""
