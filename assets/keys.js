() => {
  // Ctrl+Enter (Cmd+Enter on a Mac) runs the main action of the box or tab that has the focus.
  const byField = { "voice-name": "save-voice", "rename-to": "rename" };
  const byPanel = { "speak-panel": "generate", "clone-panel": "preview", "batch-panel": "batch-run" };
  document.addEventListener("keydown", (event) => {
    if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey)) return;
    const focused = document.activeElement;
    const field = focused && focused.closest(Object.keys(byField).map((id) => "#" + id).join(","));
    const panel = focused && focused.closest(Object.keys(byPanel).map((id) => "#" + id).join(","));
    const target = field ? byField[field.id] : panel ? byPanel[panel.id] : "generate";
    const button = document.getElementById(target);
    if (button && button.offsetParent !== null && !button.disabled) {
      event.preventDefault();
      button.click();
    }
  });
}
