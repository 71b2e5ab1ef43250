"""cutedebug.reporting: what people read, drawn from the engine's and the analyses' records.

- ``report``: one run's report.json / report.md / stuck_map.svg;
- ``stuck_map``: the stuck-map model (CTAs grouped by identical warp states) and its text and
  SVG renderers;
- ``matrix``: the triage matrix as Markdown, HTML and terminal lines;
- ``sanitize``, ``bisect``, ``mutation_matrix``, ``exec_report``, ``mismatch_map``,
  ``perturbation``: each analysis's or command's report;
- ``escape``: escaping for HTML, SVG and Markdown, and the only way links are made;
- ``files``: atomic writes with the permissions any file the user creates gets.

A new report format is a new renderer here. This package reads records; it never runs
anything (commands call the engine and analyses, then this package).
"""
