"""What the reports read of a store: one base's vectors as a :class:`~modelvec.store.Population` (``population``,
read once through ``snapshot``; which base is stored under which name: ``bases``), its nearest lists for a scoring
(``listed``), the copies among its models (``copies``), the overview ``show`` prints (``overview``) and the Parquet
export (``export``)."""
