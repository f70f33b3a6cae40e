"""How a profile buffer's bytes become the event table (docs/design.md, "Decoding").

    decode.py          buffers -> the tidy event table and the launch table (the reference rules)
    decode_records.py  one chunk of records -> rows (the numpy loop)
    decode_fast.py     the same loop compiled (numba, ahead of time), held equal to decode_records
    decode_format3.py  format-3 records (Record8) expanded to the format-2 shape the loops read
    align.py           the clocks: per-SM clock64 -> globaltimer -> rank 0, host -> GPU
    calibration.py     one GPU's measured clock facts (`epscope calibrate`), read by align.py
"""
