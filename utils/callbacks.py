"""YOLOv5's callbacks: the one extension point of a training run.

A user registers functions on named hooks and passes the object to ``train.run(callbacks=...)``::

    from utils.callbacks import Callbacks

    callbacks = Callbacks()
    callbacks.register_action("on_fit_epoch_end", "print-map", lambda vals, epoch, best, fi: print(epoch, vals[5]))
    train.run(data="data/shapes.yaml", cfg="models/ffca-yolo-n.yaml", callbacks=callbacks)

The hook names and methods are YOLOv5's, so a YOLOv5 user's callback code works unchanged. Which hooks
a run calls, with which arguments and in which order, is in docs/training.md ("Callbacks"); the
others are accepted (YOLOv5 declares them) but never called by this project. Hooks run on the main
process only (rank 0 under DDP), as in YOLOv5.

A callback that raises stops the run: :class:`CallbackError` is one line naming the hook and the
callback, and ``last.pt`` is left as the last complete state written before it. A callback that sets
``callbacks.stop_training = True`` (YOLOv5's way to end a run early) ends it at the next step boundary
with a resumable ``last.pt``; :attr:`Callbacks.stop_request` names the hook and callback that asked.

``run(hook, ..., thread=True)`` runs the callbacks synchronously, as ``thread=False`` does: in a thread
their side effects (``stop_training``, a file, an exception) would land at a moment that depends on
scheduling, and a run's result must not depend on time.
"""

from utils.errors import UserError, first_line

HOOKS = (
    "on_pretrain_routine_start", "on_pretrain_routine_end",
    "on_train_start", "on_train_epoch_start", "on_train_batch_start", "optimizer_step", "on_before_zero_grad",
    "on_train_batch_end", "on_train_epoch_end",
    "on_val_start", "on_val_batch_start", "on_val_image_end", "on_val_batch_end", "on_val_end",
    "on_fit_epoch_end", "on_model_save", "on_train_end", "on_params_update", "teardown",
)


class CallbackError(UserError):
    """A registered callback raised; the run stops with this one line."""


class Callbacks:
    """Named hooks, each holding callbacks that run in the order they were registered."""

    def __init__(self):
        self._callbacks = {hook: [] for hook in HOOKS}
        self._stop, self._request = False, None
        self._sources = []  # the objects this one was merged from (:meth:`extended`): their flags count too

    @property
    def stop_training(self) -> bool:
        """YOLOv5's flag: a callback sets it to end training at the next step boundary."""
        return self._stop or any(source.stop_training for source in self._sources)

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        self._stop = bool(value)
        if not value:
            self._request = None
            for source in self._sources:
                source.stop_training = False

    @property
    def stop_request(self) -> str | None:
        """Who set :attr:`stop_training`: "callback 'NAME' on hook 'HOOK'", or "the caller" when it was set
        outside :meth:`run`; None while it is not set."""
        if not self.stop_training:
            return None
        return self._request or next((s.stop_request for s in self._sources if s.stop_training), "the caller")

    def register_action(self, hook: str, name: str = "", callback=None) -> None:
        """Add ``callback`` (any callable) to ``hook``; ``name`` identifies it in lists and errors."""
        if hook not in self._callbacks:
            raise ValueError(f"callback hook '{hook}' does not exist; use one of: {', '.join(HOOKS)}")
        if not callable(callback):
            raise TypeError(f"callback '{name}' on hook '{hook}' is {type(callback).__name__}, not a callable")
        self._callbacks[hook].append({"name": name, "callback": callback})

    def get_registered_actions(self, hook: str | None = None):
        """The ``{'name', 'callback'}`` entries of ``hook``, or of every hook as a dict when ``hook`` is None."""
        return self._callbacks[hook] if hook else self._callbacks

    def run(self, hook: str, *args, thread: bool = False, **kwargs) -> None:
        """Call every callback of ``hook`` with the arguments; one that raises becomes :class:`CallbackError`.
        ``thread`` is YOLOv5's keyword, accepted and not passed on: the callbacks always run here, in order
        (see the module's docstring)."""
        if hook not in self._callbacks:
            raise ValueError(f"callback hook '{hook}' does not exist; use one of: {', '.join(HOOKS)}")
        for action in self._callbacks[hook]:
            stopping = self.stop_training
            try:
                action["callback"](*args, **kwargs)
            except UserError:
                raise
            except Exception as e:
                raise CallbackError(f"callback '{action['name']}' on hook '{hook}' raised {type(e).__name__}: "
                                    f"{first_line(e)}; the run stopped there") from e
            if self.stop_training and not stopping:
                self._request = f"callback '{action['name']}' on hook '{hook}'"

    def extended(self, other: "Callbacks | None") -> "Callbacks":
        """A new object with this one's callbacks, then ``other``'s, per hook (neither is changed)."""
        merged = Callbacks()
        for source in (self, other):
            if source is None:
                continue
            if not isinstance(source, Callbacks):
                raise UserError(f"callbacks={type(source).__name__}: expected a utils.callbacks.Callbacks object")
            for hook, actions in source.get_registered_actions().items():
                merged._callbacks[hook].extend(actions)
            merged._sources.append(source)
        return merged
