"""miro.worker"""
