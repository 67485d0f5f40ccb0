"""Plumbing (a reader of the method may skip this file): the page of `evaluate.py tokens`, one self-contained HTML
file (inline CSS, no script, nothing fetched) that shows one SFT example's response token by token, coloured by
the teacher's entropy H_t or by CurioSFT's cross-entropy weight w_t, each token's numbers on hover and in a table.
The numbers are computed in plumbing/token_view.py (curio_token_view); this file only lays them out."""
import codecs
import html
import json

# Colour stops (position in [0, 1], RGB). H_t: white to dark red (a sequential scale, Eq. 7's pivot in the middle);
# w_t: purple below 1 (sharpening held back), white at 1 (plain cross-entropy), orange above 1 (learned harder).
H_STOPS = [(0.0, (255, 255, 255)), (0.25, (255, 237, 160)), (0.5, (254, 178, 76)), (0.75, (240, 59, 32)),
           (1.0, (128, 0, 38))]
W_STOPS = [(0.0, (84, 39, 136)), (0.25, (153, 142, 195)), (0.5, (255, 255, 255)), (0.75, (241, 163, 64)),
           (1.0, (179, 88, 6))]

STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; margin: 0;
       background: #f6f6f4; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 32px 48px; }
h1 { font-size: 24px; margin: 0 0 4px; }
.about { color: #555; margin: 0 0 18px; font-size: 13px; }
.about code { background: #ecebe7; padding: 1px 5px; border-radius: 3px; }
.cards { display: grid; grid-template-columns: repeat(6, 1fr); gap: 10px; margin: 0 0 16px; }
.card { background: #fff; border: 1px solid #e2e0da; border-radius: 8px; padding: 9px 12px; }
.card b { display: block; font-size: 21px; font-variant-numeric: tabular-nums; }
.card span { color: #666; font-size: 12.5px; }
.explain { display: flex; gap: 22px; align-items: center; background: #fff; border: 1px solid #e2e0da;
           border-radius: 8px; padding: 12px 16px; margin: 0 0 16px; font-size: 14px; }
.explain p { margin: 4px 0; }
.explain svg { flex: none; }
svg text { font: 11px system-ui, sans-serif; fill: #444; }
.panel { background: #fff; border: 1px solid #e2e0da; border-radius: 8px; padding: 14px 18px 18px; }
.controls { display: flex; align-items: center; gap: 18px; flex-wrap: wrap; margin-bottom: 10px; }
.panel > input { position: absolute; opacity: 0; pointer-events: none; }
.controls label { cursor: pointer; padding: 5px 12px; border: 1px solid #cfcdc6; border-radius: 16px;
                  font-size: 13.5px; }
#by-h:checked ~ .controls label[for=by-h], #by-w:checked ~ .controls label[for=by-w] {
  background: #1d1d1f; color: #fff; border-color: #1d1d1f; }
.legend { display: flex; align-items: center; gap: 8px; font-size: 12.5px; color: #444; margin: 0 0 12px; }
.bar { width: 320px; height: 12px; border-radius: 3px; border: 1px solid #ccc; position: relative; }
.bar i { position: absolute; top: -4px; bottom: -4px; border-left: 2px dashed #333; }
.legend-w, #by-w:checked ~ .legend-h { display: none; }
#by-w:checked ~ .legend-w { display: flex; }
details.prompt { margin: 0 0 10px; font-size: 13px; color: #555; }
details.prompt pre { white-space: pre-wrap; background: #f3f2ee; padding: 8px 10px; border-radius: 6px;
                      margin: 6px 0 0; }
.text { font: 15px/1.9 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; white-space: pre-wrap;
        word-break: break-word; }
.t { background: var(--h); color: var(--hc); border-radius: 2px; position: relative; padding: 1px 0;
     box-shadow: inset -1px 0 0 rgba(255, 255, 255, .75); }    /* where one token ends and the next begins */
#by-w:checked ~ .text .t { background: var(--w); color: var(--wc); }
.t:hover { outline: 2px solid #1d1d1f; z-index: 2; }
.t:hover::after { content: attr(data-tip); position: absolute; left: 0; top: 1.9em; z-index: 3; white-space: pre;
  background: #1d1d1f; color: #fff; font: 12px/1.45 ui-monospace, Menlo, Consolas, monospace; padding: 7px 9px;
  border-radius: 5px; box-shadow: 0 2px 8px rgba(0,0,0,.25); pointer-events: none; }
.nl { color: #999; }
.eos { font-size: 12px; }
details.table { margin-top: 22px; }
details.table summary { cursor: pointer; font-weight: 600; }
table { border-collapse: collapse; margin-top: 8px; font: 12.5px ui-monospace, Menlo, Consolas, monospace;
        background: #fff; }
th, td { padding: 2px 10px; border-bottom: 1px solid #eee; text-align: right; }
th { position: sticky; top: 0; background: #f3f2ee; font-family: system-ui, sans-serif; }
td.tok, th:nth-child(2) { text-align: left; white-space: pre; }
"""


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text. Byte-level BPE tokens (Qwen's) are decoded byte by byte, so a character split over tokens
    shows whole on its last one; other tokens (special ones, other tokenizers') as decode([id])."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = []
    for token_id, piece in zip(ids, tokenizer.convert_ids_to_tokens(ids)):
        if token_id in tokenizer.all_special_ids or not all(c in byte_of for c in piece):
            texts.append(decoder.decode(b"", final=True) + tokenizer.decode([token_id]))
            decoder.reset()
        else:
            texts.append(decoder.decode(bytes(byte_of[c] for c in piece)))
    return texts


def _colour(stops, x: float) -> tuple[int, int, int]:
    """The colour at x in [0, 1] (clamped) between the stops."""
    x = min(1.0, max(0.0, x))
    for (x0, c0), (x1, c1) in zip(stops, stops[1:]):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return tuple(round(a + f * (b - a)) for a, b in zip(c0, c1))
    return stops[-1][1]


def _css(rgb) -> tuple[str, str]:
    """(background, readable text colour) of an RGB colour."""
    luminance = (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]) / 255
    return "#%02x%02x%02x" % rgb, "#fff" if luminance < 0.5 else "#1d1d1f"


def _gradient(stops) -> str:
    return "linear-gradient(to right, " + ", ".join(f"{_css(c)[0]} {100 * x:.0f}%" for x, c in stops) + ")"


def _scatter(h: list[float], w: list[float], h_scale: float, h_pivot: float) -> str:
    """An inline SVG: w_t against H_t, one dot per token, with the line w_t = 1 and the pivot marked."""
    width, height, left, bottom, top, right = 330, 190, 38, 30, 10, 8
    w_low, w_high = min(min(w, default=1.0), 0.9), max(max(w, default=1.0), 1.1)
    h_high = max(max(h, default=0.0), h_scale)

    def x(v):
        return left + (width - left - right) * v / h_high

    def y(v):
        return top + (height - top - bottom) * (w_high - v) / (w_high - w_low)

    axis_y, middle = height - bottom, (top + height - bottom) / 2
    ticks = [(y(1), "1")] + [(y(v), f"{v:.2f}") for v in (w_high, w_low) if abs(y(v) - y(1)) > 12]
    parts = [f'<svg width="{width}" height="{height}" role="img" aria-label="w_t against H_t">',
             f'<line x1="{left}" x2="{width - right}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#999" '
             'stroke-dasharray="4 3"/>',
             f'<line x1="{x(h_pivot):.1f}" x2="{x(h_pivot):.1f}" y1="{top}" y2="{axis_y}" stroke="#ccc"/>',
             f'<path d="M{left} {top}V{axis_y}H{width - right}" fill="none" stroke="#333"/>',
             '<g fill="#c0392b" fill-opacity="0.55">',
             *(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="2.6"/>' for a, b in zip(h, w)), "</g>",
             *(f'<text x="{left - 4}" y="{at + 4:.1f}" text-anchor="end">{label}</text>' for at, label in ticks),
             f'<text x="{left}" y="{axis_y + 14}">0</text>',
             f'<text x="{x(h_pivot):.1f}" y="{axis_y + 14}" text-anchor="middle">{h_pivot}</text>',
             f'<text x="{width - right}" y="{axis_y + 14}" text-anchor="end">{h_high:.1f}</text>',
             f'<text x="{(left + width) / 2:.0f}" y="{height - 2}" text-anchor="middle">teacher entropy Hₜ '
             '(nats)</text>',
             f'<text x="10" y="{middle:.0f}" text-anchor="middle" transform="rotate(-90 10 {middle:.0f})">wₜ</text>',
             "</svg>"]
    return "".join(parts)


def render(tokenizer, ids: list[int], mask: list[int], view: dict, summary: dict, cfg, about: dict) -> str:
    """The page. ids, mask: the example as tokenize_sft gives it; view: curio_token_view's per-token tensors for the
    positions whose next token is trained, in order; summary: curio_loss.summarize of the view; cfg: the
    LossConfig; about: model, teacher and example, as shown."""
    values = {k: [float(x) for x in view[k]] for k in ("teacher_entropy", "delta", "tau", "lp", "lq", "weight")}
    states = [next((name for name, key in (("forced to tau_min", "forced_tau_min"), ("clamped low", "clamped_low"),
                                           ("clamped high", "clamped_high")) if key in view and view[key][i] > 0), "")
              for i in range(len(values["lp"]))]
    first = mask.index(1)                                  # the first response token; the prompt comes before
    texts = token_texts(tokenizer, ids)
    h_scale = 2 * cfg.h_pivot                              # Eq. 7's pivot in the middle of the H_t scale
    w_scale = max(0.05, max((abs(w - 1) for w in values["weight"]), default=0.05))
    spans = []
    for i, text in enumerate(texts[first:]):
        h, w = values["teacher_entropy"][i], values["weight"][i]
        h_bg, h_ink = _css(_colour(H_STOPS, h / h_scale))
        w_bg, w_ink = _css(_colour(W_STOPS, 0.5 + (w - 1) / (2 * w_scale)))
        tip = (f"{text!r}\nHₜ  {h:.3f} nats\nΔₜ  {values['delta'][i]:.3f}\nτₜ  {values['tau'][i]:.3f}"
               f"{'  (' + states[i] + ')' if states[i] else ''}\nlp  {values['lp'][i]:.3f}\n"
               f"lq  {values['lq'][i]:.3f}\nwₜ  {w:.3f}")
        shown = html.escape(text.replace("\n", "↵")) if i + first < len(ids) - 1 else \
            f'<span class="eos">{html.escape(text or "EOS")}</span>'
        breaks = "\n" * text.count("\n")
        spans.append(f'<span class="t" style="--h:{h_bg};--hc:{h_ink};--w:{w_bg};--wc:{w_ink}" '
                     f'data-tip="{html.escape(tip)}">{shown}</span>{breaks}')
    rows = "".join(
        f"<tr><td>{i + 1}</td><td class=tok>{html.escape(repr(t))}</td>"
        + "".join(f"<td>{values[k][i]:.3f}</td>" for k in ("teacher_entropy", "delta", "tau", "lp", "lq", "weight"))
        + f"<td>{states[i]}</td></tr>" for i, t in enumerate(texts[first:]))
    cards = [(len(values["lp"]), "response tokens, EOS included"),
             (f"{summary['w_top20']:.3f}", "mean w<sub>t</sub>, top 20% of H<sub>t</sub>"),
             (f"{summary['w_bottom80']:.3f}", "mean w<sub>t</sub>, the other 80%"),
             (f"{summary['w_frac_above_1']:.0%}", "tokens with w<sub>t</sub> &gt; 1"),
             (f"{summary['teacher_entropy_top20']:.2f} / {summary['teacher_entropy_bottom80']:.2f}",
              "mean H<sub>t</sub> (nats), top 20% / other 80%"),
             (f"{summary['tau_mean']:.3f}", f"mean τ<sub>t</sub>, in [{cfg.tau_min}, {cfg.tau_max}]")]
    card_html = "".join(f'<div class="card"><b>{v}</b><span>{k}</span></div>' for v, k in cards)
    about_html = " · ".join(f"{k}: <code>{html.escape(str(v))}</code>" for k, v in about.items())
    settings = (f"α {cfg.alpha}, Δ<sub>max</sub> {cfg.delta_max}, γ {cfg.gamma}, H<sub>pivot</sub> {cfg.h_pivot}, "
                f"top-k {cfg.top_k}")
    data = json.dumps({"tokens": texts[first:], "target": [int(x) for x in view["target"]], **values,
                       "state": states, "summary": summary, "about": about}).replace("</", "<\\/")  # stays in <script>
    prompt_html = html.escape("".join(texts[:first]))
    scatter = _scatter(values["teacher_entropy"], values["weight"], h_scale, cfg.h_pivot)
    h_bar, w_bar = (f'<span class="bar" style="background:{_gradient(stops)}"><i style="left:50%"></i></span>'
                    for stops in (H_STOPS, W_STOPS))                     # the middle mark: the pivot, w_t = 1
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>CurioSFT, token by token: {html.escape(about['example'])}</title>
<style>{STYLE}</style></head>
<body><main>
<h1>Where CurioSFT acts, token by token</h1>
<p class="about">{about_html} · {settings}</p>
<div class="cards">{card_html}</div>
<div class="explain"><div>
<p>At each response token the teacher's entropy <b>H<sub>t</sub></b> (over its top {cfg.top_k} logits) sets a
wished-for increase <b>Δ<sub>t</sub></b> = {cfg.delta_max} sigmoid({cfg.gamma} (H<sub>t</sub> − {cfg.h_pivot}))
(Eq. 7). The temperature <b>τ<sub>t</sub></b> heats the teacher to entropy H<sub>t</sub> + Δ<sub>t</sub>, and
<b>lq</b> is the expert token's log-probability under the heated teacher, <b>lp</b> under the student.</p>
<p>CurioSFT's gradient is cross-entropy's times <b>w<sub>t</sub> = 1 − α (lp − lq)</b>: below 1 where the student
is surer of the expert token than the heated teacher, so sharpening is held back; above 1 where the token is
unfamiliar, so it is learned harder. Factual tokens (low H<sub>t</sub>) keep w<sub>t</sub> near 1.</p>
<p>Hover a token for its numbers; the table at the end lists them all.</p></div>{scatter}</div>
<div class="panel">
<input type="radio" name="colour" id="by-h" checked><input type="radio" name="colour" id="by-w">
<div class="controls"><label for="by-h">colour: teacher entropy H<sub>t</sub></label>
<label for="by-w">colour: weight w<sub>t</sub></label></div>
<div class="legend legend-h"><span>H<sub>t</sub> 0</span>{h_bar}
<span>{h_scale:.1f}+ nats · dashed: H<sub>pivot</sub> {cfg.h_pivot}, where Δ<sub>t</sub> is half of
Δ<sub>max</sub></span></div>
<div class="legend legend-w"><span>w<sub>t</sub> {1 - w_scale:.2f}</span>{w_bar}
<span>{1 + w_scale:.2f} · purple: sharpening held back · white: plain cross-entropy (w<sub>t</sub> = 1) ·
orange: learned harder</span></div>
<details class="prompt"><summary>the prompt ({first} tokens, not trained)</summary><pre>{prompt_html}</pre></details>
<div class="text">{"".join(spans)}</div>
</div>
<details class="table"><summary>every token</summary>
<table><tr><th>#</th><th>token</th><th>H<sub>t</sub></th><th>Δ<sub>t</sub></th><th>τ<sub>t</sub></th><th>lp</th>
<th>lq</th><th>w<sub>t</sub></th><th></th></tr>
{rows}</table></details>
<script type="application/json" id="token-data">{data}</script>
</main></body></html>
"""
