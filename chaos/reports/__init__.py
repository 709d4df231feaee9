"""What a run says: report.json, the faults that fired, the terminal's tables and progress lines,
merged campaigns, GitHub annotations, the sweep's plot."""
