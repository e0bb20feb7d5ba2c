"""Tasks and their environments: the TaskInstance schema, loaders of published datasets, decontamination, bug
synthesis and validation, procedural micro repositories, test runs and their parsing."""
