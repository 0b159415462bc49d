"""Paper-style reports from result rows: aggregation, seaborn figures, jinja2 HTML and Markdown."""
