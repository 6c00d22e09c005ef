"""Running a solver: `runner` runs one and checks its schedule in the simulator, `watchdog` runs
it in a child process that holds the time limit and keeps the best schedule on a signal, and
`cost_bound` is the lower bound on the recomputation cost that results are measured against.
"""
