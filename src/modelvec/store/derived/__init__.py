"""Files derived from a store and kept beside it, each verified before it is read again: the one owner of their names
and of what each was computed for (``cache``), the vectors' inner products (``products``), each model's nearest
lists where every pair's would not fit (``neighbours``, from ``landmarks``), and the base's probe inputs
(``inputs``)."""
