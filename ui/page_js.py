"""The page's script: keeps each token's hover box inside the viewport (run once, on the header's load)."""

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
  const onEvent = (e) => {
    const tok = e.target && e.target.closest ? e.target.closest('.asym-panel .tok') : null;
    if (tok) place(tok);
  };
  document.addEventListener('mouseover', onEvent, true);
  document.addEventListener('focusin', onEvent, true);
  document.addEventListener('click', onEvent, true);
}
"""
