from sparkdl import HorovodRunner

params = {"lr": 0.1}
np_workers = 4


def train(lr=0.01, epochs=1):
    import horovod.torch as hvd
    hvd.init()
    return hvd.rank()


hr = HorovodRunner(np=2)
hr.run(train, lr=0.1, epochs=2)
HorovodRunner(np=-2, driver_log_verbosity="all").run(train)
result = HorovodRunner(np=np_workers).run(train, **params)
HorovodRunner(np=0).run(train)
