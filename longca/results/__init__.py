"""From rows to what a reader sees: Parquet tables (``parquet``), the tables the report shows
(``tables``), figures (``plots``) and the HTML report (``report``).  Reads rows; never measures."""
