"""Reports of result folders: terminal tables (`terminal`, `server`, `compare`, `study_terminal`), and
pages people send each other: one self-contained HTML file per run, comparison or study, the same
figures as PNG and the records as CSV (`build` picks the report, `run_report`, `compare_report` and
`study_report` compose it, `html_page`, `png` and `csv_export` write it)."""
