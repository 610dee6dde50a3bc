from mtbench.cli import main

main()
