from remat_cli.cli import main

main()
