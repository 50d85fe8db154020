"""Calls `AsyncClient` (client.py) is made of, grouped by the API's resource, with their
typed views: history.py, a runtime's history and the fleet's. (The package's top level
holds twenty modules, as many as a reader takes in at a glance.)"""
