"""Operating upwell: tags, the janitor, the dashboard's data, cost roll-ups, estimates."""
