from solrl_cli.app import main

main()
