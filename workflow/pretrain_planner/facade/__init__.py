"""The parse-time facade: what the Snakefile's rules and the CLI ask before anything runs (the validated config, the
plan, each rule's inputs, threads and targets), above every stage it describes. Nothing below it imports it.
Imports no torch."""
