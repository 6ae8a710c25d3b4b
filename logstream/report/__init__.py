"""What a replay shows a person: anomalies grouped by template, and the HTML report."""
