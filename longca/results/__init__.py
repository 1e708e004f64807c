"""From rows to what a reader sees: Parquet tables (``parquet``), the tables the report shows
(``tables``), figures (``plots``) and the HTML report (``report``), and the rows of cells whose job
died (``lost_cells``).  Reads rows; never measures."""
