from remat_cli.cli import run

run()
