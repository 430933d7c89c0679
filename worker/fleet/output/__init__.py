"""From finished requests to results: the rows and their Parquet schema, the part files, merging them, and where
result files live."""
