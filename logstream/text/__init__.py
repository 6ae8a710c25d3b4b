"""What a log line is made of: masking, templates, event times, explanations in words, and
safe printing of log text.
"""
