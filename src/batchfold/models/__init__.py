"""Reference models built on batchfold's public API."""
