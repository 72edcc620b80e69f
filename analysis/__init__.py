"""Aggregate lm-ablate runs into comparison tables, figures and reports.

The package is the pipeline, one folder per stage, each importing only the stages before it:

* ``sources/`` — where runs come from, read into one ``RunSet``: run directories (``load.py``), the W&B API
  (``wandb_api.py``), W&B offline files (``wandb_offline.py``), both at once (``combined.py``); ``values.py``
  is how a config value is spelled and ordered.
* ``compute/`` — numbers and verdicts, with codes where a result needs explaining; no sentences for people and
  no matplotlib: statistics, the design and its comparisons (``compare.py``), best LR, claims, scaling fits.
* ``present/`` — the document model (``document.py``: blocks rendered to HTML and Markdown), the formatting of
  values (``format.py``), the report's sections (``sections/``) and their figures (``figures/``), which share
  one plotting style (``style.py``); ``report.py`` puts the sections in order.
* ``publish/`` — the W&B workspace and the W&B Report, built on ``compute/`` and ``present/``.

The commands sit on top: ``python -m analysis.report`` (``report.py``: sources -> compute -> document -> files),
``analysis.wandb_report`` and ``analysis.wandb_dashboard`` (thin entries into ``publish/``); ``cli.py`` is their
one-line errors, ``parallel.py`` the forked map that loading and drawing share.

A new analysis is one compute module (``compute/<name>.py``, numbers and codes), one section
(``present/sections/<name>.py``, its words and tables) and its figures (``present/figures/<name>.py``), then one
line in ``present/report.py`` that places the section (and in ``report.py`` if it writes a table).
tests/test_analysis_layout.py checks the layering: no import circle, no private name across modules, compute/
free of matplotlib and present/.
"""
