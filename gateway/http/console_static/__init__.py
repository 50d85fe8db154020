"""The console's static files (HTML, CSS, ES modules): package data that console.py
serves."""
