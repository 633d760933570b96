"""Parts of the scheduler, as SGLang splits them (`scheduler_components/`)."""
