"""How a run lies on disk and is verified: events.parquet, launches.parquet, manifest.json.

    schema.py     the event table's columns and dtypes (the data model every stage shares)
    runstore.py   writing a run (one rename, checksummed), re-exporting the reader's load_run
    runreader.py  reading a run back: checksums, versions, every column checked
    validate.py   what a run may contain (manifest fields, table invariants), checked in one place
    atomic.py     exclusive temporaries, one-rename placement, regular files only
    hashcache.py  the SHA-256 of a run's data files, remembered across processes
"""
