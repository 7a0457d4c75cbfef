"""The page's scripts (run once, on the header's load): one token's hover box open at a time, inside the viewport
(:data:`TOOLTIP_JS`), and the page's layout fixes (:data:`LAYOUT_JS`).

A box opens on hover (a mouse), on keyboard focus, or on a tap or click, which keep it open; opening one closes any
other, and a tap or click anywhere else (or Escape) closes it. CSS alone cannot do this on a phone: a tapped
token keeps both ``:hover`` and ``:focus``, so boxes tapped one after another stayed open over each other.
"""

TOOLTIP_JS = r"""
if (!window.__asymTooltips) {
  window.__asymTooltips = true;
  const margin = 8;
  const place = (tok) => {
    const tip = tok.querySelector(':scope > .tok-tip');
    if (!tip) return;
    tip.style.left = '0px';
    tip.style.top = '';
    tip.style.bottom = '';
    const vw = document.documentElement.clientWidth, vh = window.innerHeight;
    const r = tip.getBoundingClientRect();
    if (!r.width) return;
    let dx = 0;
    if (r.right > vw - margin) dx = vw - margin - r.right;
    if (r.left + dx < margin) dx = margin - r.left;
    tip.style.left = dx + 'px';
    const t = tok.getBoundingClientRect();
    if (r.bottom > vh - margin && t.top - r.height - 4 >= margin) {
      tip.style.top = 'auto';
      tip.style.bottom = (t.height + 4) + 'px';
    }
  };
  const tokenOf = (el) => {
    const tok = el && el.closest ? el.closest('.asym-panel .tok') : null;
    return tok && tok.querySelector(':scope > .tok-tip') ? tok : null;
  };
  const closeAll = (except) => {
    document.querySelectorAll('.asym-panel .tok.tok-open').forEach((t) => {
      if (t !== except) t.classList.remove('tok-open', 'tok-pinned');
    });
  };
  const open = (tok, pinned) => {
    closeAll(tok);
    tok.classList.add('tok-open');
    if (pinned) tok.classList.add('tok-pinned');
    place(tok);
  };
  // Hovering opens a box only where the main pointer hovers (a mouse): a phone also sends mouse events after a
  // tap, and again where its last touch was whenever the page moves, which would open a second box.
  const hovers = window.matchMedia('(hover: hover)');
  document.addEventListener('mouseover', (e) => {
    const tok = hovers.matches ? tokenOf(e.target) : null;
    if (tok && !tok.classList.contains('tok-open')) open(tok, false);
  }, true);
  document.addEventListener('mouseout', (e) => {
    const tok = hovers.matches ? tokenOf(e.target) : null;
    if (tok && !tok.contains(e.relatedTarget) && !tok.classList.contains('tok-pinned')) tok.classList.remove('tok-open');
  }, true);
  document.addEventListener('click', (e) => {
    const tok = tokenOf(e.target);
    if (tok) open(tok, true);
    else closeAll(null);
  }, true);
  document.addEventListener('focusin', (e) => {
    const tok = tokenOf(e.target);
    if (tok) open(tok, true);
  }, true);
  document.addEventListener('focusout', (e) => {
    const tok = tokenOf(e.target);
    if (tok && !tokenOf(e.relatedTarget)) tok.classList.remove('tok-open', 'tok-pinned');
  }, true);
  document.addEventListener('keydown', (e) => { if (e.key === 'Escape') closeAll(null); }, true);
}
"""

#: Two layout fixes. (1) Gradio draws an image lazily (``loading="lazy"``): the JSD chart, far below the first screen
#: on a phone, stayed blank until scrolled to, and blank in a full-page screenshot; it is loaded at once. (2) Where the
#: answer stands below the inputs (a phone, a narrow window: Gradio stacks the columns), the page carries the class
#: ``asym-stacked``, which shows the status's "Jump to the answer" link (``ui/style.css``); the link scrolls there.
LAYOUT_JS = r"""
if (!window.__asymLayout) {
  window.__asymLayout = true;
  let pending = false;
  const update = () => {
    pending = false;
    document.querySelectorAll('#asym-chart img[loading="lazy"]').forEach((img) => { img.loading = 'eager'; });
    const answer = document.getElementById('asym-answer'), run = document.getElementById('asym-run');
    if (answer && run) {
      const below = answer.getBoundingClientRect().top >= run.getBoundingClientRect().bottom;
      document.body.classList.toggle('asym-stacked', below);
    }
  };
  // at most once a frame: a streaming answer changes the page many times a second
  const schedule = () => { if (!pending) { pending = true; requestAnimationFrame(update); } };
  new MutationObserver(schedule).observe(document.body, {childList: true, subtree: true});
  window.addEventListener('resize', schedule);
  schedule();
  document.addEventListener('click', (e) => {
    const link = e.target && e.target.closest ? e.target.closest('a.asym-jump') : null;
    const answer = document.getElementById('asym-answer');
    if (!link || !answer) return;
    e.preventDefault();  // no "#asym-answer" in the address: a reload starts at the top, as the page does
    answer.scrollIntoView({behavior: 'smooth', block: 'start'});
  }, true);
}
"""
