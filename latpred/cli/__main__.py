"""`python -m latpred.cli`: the same as the `latpred` console script."""

from latpred.cli import main

main()
