"""The exit codes of a `remat` process: what `remat solve` and the other commands return, and what
a caller that runs them as child processes (`remat sweep`, `remat compare`) reads back.
"""

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
#: stdout's reader has gone (`| head`): 128 + SIGPIPE, as a process the signal killed
EXIT_READER_GONE = 141
