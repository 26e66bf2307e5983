"""What the tests of every tier share, one module for each thing: the checkout's paths,
the command line, synthetic runs, processes and the servers the tests start, the simulated
workflow's whole runs, and the fixture trees of nodes. No test module imports another."""
