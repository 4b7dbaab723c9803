"""The store's formats on disk: the vector file (``vectorfile``: append-only float32, each vector's xxh3), its reads
a block at a time, checked (``blocks``), the tables declared once with their migrations (``schema``) and the rows
written into them (``records``), the lock another process waits on (``lock``), and the format of every verified
file kept beside a store (``cachefile``)."""
