"""The canonical snapshot format, below the backends and checkpoint storage (SPEC §6.2).

What a keyed snapshot is, key group by key group (``snapshot.py``), the meta data of its states
(``meta.py``), the bytes of its entries (``codec.py``) and of its file (``keyed_file.py``), and
what a restoring backend reads back (``restore.py``). The backends write and read this format;
checkpoint storage stores, names and rescales the files. Neither imports the other for it.
"""
