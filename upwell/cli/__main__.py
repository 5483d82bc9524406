from upwell.cli import main

main()
