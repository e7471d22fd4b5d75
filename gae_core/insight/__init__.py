"""What the dashboard shows, as data: the advantage explorer's tables, the λ comparison and its
statistics, the Plotly figures and the form and status views. Never imports Streamlit."""
