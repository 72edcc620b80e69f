"""Present: the report as a document (blocks rendered to HTML and Markdown), the formatting of values, the
report's sections (sections/) and their figures (figures/, sharing style.py)."""
