"""raylab.algorithms: RLlib new-API-stack configs and raylab's Learner subclasses."""
