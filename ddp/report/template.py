"""The page's one template (Jinja2, autoescaped: every cell, caption and error text comes from
a run's records or a rank's message and may hold ``<`` or ``&``). Inline CSS, no script, no
URL the browser would fetch: the file opens from disk, offline."""

from __future__ import annotations

__all__ = ["TEMPLATE"]

TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ page.title }}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 72em;
       padding: 0 1em; color: #1b1b1b; }
header { border-bottom: 2px solid #ddd; margin-bottom: 1.5em; }
code, pre, td { font-family: ui-monospace, monospace; font-size: 13px; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; }
.verdict { font-size: 1.3em; font-weight: 600; padding: .3em .5em; display: inline-block; }
.ok { background: #dff5e1; } .failed { background: #fbe0e0; } .neutral { background: #eef; }
.figure { font-size: 1.6em; font-weight: 700; margin: .3em 0; }
.problem { color: #a40000; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border: 1px solid #ccc; padding: .2em .6em; text-align: left; }
th { background: #f0f0f0; } td.num { text-align: right; }
caption { caption-side: top; text-align: left; font-style: italic; padding-bottom: .3em; }
img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-style: italic; }
</style>
</head>
<body>
<header>
<h1>{{ page.title }}</h1>
<p><code id="command">{{ page.headline.command }}</code></p>
<p id="verdict" class="verdict {{ verdict_class }}">{{ page.headline.verdict }}</p>
{% if page.headline.figure %}<p id="figure" class="figure">{{ page.headline.figure }}</p>{% endif %}
{% for problem in page.problems %}<p class="problem">{{ problem }}</p>{% endfor %}
</header>
{% for section in sections %}
<section>
<h2>{{ section.title }}</h2>
{% for block in section.blocks %}
{% if block.kind == "table" %}
<table>{% if block.caption %}<caption>{{ block.caption }}</caption>{% endif %}
<tr>{% for h in block.headers %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in block.rows %}<tr>{% for cell in row %}<td{% if cell.num %} class="num"{% endif %}>
{{- cell.text }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% elif block.kind == "image" %}
<figure><img src="{{ block.src }}" alt="{{ block.name }}">
<figcaption>{{ block.caption or block.name }}</figcaption></figure>
{% elif block.kind == "missing" %}
<p class="problem">figure {{ block.name }}: {{ block.why }}</p>
{% elif block.kind == "pre" %}
<pre>{{ block.lines | join("\\n") }}</pre>
{% else %}
{% for line in block.lines %}<p>{{ line }}</p>{% endfor %}
{% endif %}
{% endfor %}
</section>
{% endfor %}
{% if links %}
<section>
<h2>Files</h2>
<ul>
{% for link in links %}<li>
{% if link.exists %}<a href="{{ link.href }}">{{ link.href }}</a>
{% else %}<span class="problem">{{ link.href }} (missing)</span>{% endif %}
{% if link.note %}: {{ link.note }}{% endif %}</li>
{% endfor %}</ul>
{% if has_trace %}<p id="perfetto">To open the trace: go to ui.perfetto.dev,
click "Open trace file" and pick trace.json (it is read in the browser, not uploaded);
chrome://tracing reads it too.</p>{% endif %}
</section>
{% endif %}
</body>
</html>
"""
