// Mermaid for the diagrams: pymdownx.superfences prints each ```mermaid fence as a
// <div class="mermaid"> (mkdocs.yml), which Mermaid draws once the page has loaded.
mermaid.initialize({ startOnLoad: true });
