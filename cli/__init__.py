"""miro.cli"""
