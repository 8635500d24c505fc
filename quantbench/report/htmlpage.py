"""report.html: the report's Markdown rendered as one page (relative image links, opens from disk in any
browser), with the check a headless browser reads back.
"""

from __future__ import annotations




# A check any browser runs on load, read back by the headless-browser test: how many images
# decoded (naturalWidth > 0), which did not, and every script or resource error.
_CHECK = """<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target;
    errors.push(t && t.tagName ? t.tagName.toLowerCase() + " " + (t.getAttribute("src") || "") : String(e.message));
  }, true);
  window.addEventListener("load", function () {
    var imgs = document.images, ok = 0, bad = [];
    for (var i = 0; i < imgs.length; i++) {
      if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; } else { bad.push(imgs[i].getAttribute("src")); }
    }
    var b = document.body;
    b.setAttribute("data-images", String(imgs.length));
    b.setAttribute("data-images-loaded", String(ok));
    b.setAttribute("data-images-broken", bad.join(" "));
    b.setAttribute("data-errors", errors.join(" | "));
    b.setAttribute("data-checked", "yes");
  });
})();
</script>"""


_STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
img { max-width: 100%; }
code { background: #f5f5f5; padding: 0 0.2em; }
h4 + p img, p > img { margin: 0.25em 0.5em 0.25em 0; vertical-align: top; }
</style>"""


def render_html(markdown_text: str) -> str:
    """report.md's text as one HTML page that opens from disk (images by relative path, no server)."""
    import html

    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables", "fenced_code", "sane_lists"], output_format="html")
    title = next((ln[2:].strip() for ln in markdown_text.splitlines() if ln.startswith("# ")), "quantbench report")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n{_STYLE}\n{_CHECK}\n</head>\n<body>\n{body}\n</body>\n</html>\n")
