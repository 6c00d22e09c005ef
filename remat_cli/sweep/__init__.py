"""The sweep behind `remat sweep` (its command is in :mod:`remat_cli.cli.sweep`): every (graph, budget, solver) cell, each solve in its own process.

Layout (imports point downward):
  cells.py      what a cell is, its key, the JSON Lines results file (append-only, one record a line)
  runner.py     one solve in a child `remat solve` process under a time limit (shared with `remat compare`)
                and one cell turned into a record; runs the same on the local pool and on Dask workers
  pool.py       the embedded pool of local processes (default: one solve for every two cores)
  dask_backend.py  the same cells as tasks on a Dask distributed cluster (`--scheduler tcp://...`)
  sweep.py      the loop both backends share: skip finished cells, write each record as it arrives
  plot.py, report.py  trade-off and memory figures (matplotlib, Agg), the static HTML report
"""
